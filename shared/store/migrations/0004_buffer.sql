-- The buffer service's own store: scored rollouts indexed by run, task, policy version and env.
-- Fed by its projection (position tracked in projection_tracking under the name 'buffer');
-- trajectories larger than a threshold live in the object store (uri + sha256), not here.
-- Timestamps come from events, so a rebuild produces identical rows.

create table if not exists buffer_runs (
    run_id text primary key,
    env_slug text not null,
    env_version int not null,
    env_hash text not null,
    model text not null,
    split text,
    n int not null,
    policy_version int not null,
    requested_at timestamptz not null
);
create index if not exists buffer_runs_env on buffer_runs (env_slug, env_version);

create table if not exists buffer_rollouts (
    rollout_id text primary key,
    run_id text not null,
    env_slug text not null,
    env_version int not null,
    env_hash text not null,
    task_index int not null,
    sample_index int not null,
    model text not null,
    policy_version int not null,
    seed bigint,
    trajectory jsonb,
    trajectory_uri text,
    trajectory_sha256 text,
    trajectory_bytes int,
    has_tokens boolean,
    generation_error text,
    score double precision,
    passed boolean,
    primitives jsonb,
    error text,
    generated_seq bigint not null,
    scored_seq bigint,
    generated_at timestamptz not null,
    scored_at timestamptz
);
create index if not exists buffer_rollouts_run_task on buffer_rollouts (run_id, task_index);
create index if not exists buffer_rollouts_env_task on buffer_rollouts (env_slug, task_index);
create index if not exists buffer_rollouts_policy on buffer_rollouts (policy_version);
