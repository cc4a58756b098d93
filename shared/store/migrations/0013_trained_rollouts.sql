-- Which policy versions trained on each rollout, and where the per-token signals of that step
-- are (advantage, importance ratio, actor-vs-learner gap, clipped): the viewer's token shading.
create table if not exists trained_rollouts (
    rollout_id text not null,
    model text not null,
    version int not null,
    job_id text,
    signals_uri text not null,
    signals_sha256 text not null,
    primary key (rollout_id, model, version)
);
