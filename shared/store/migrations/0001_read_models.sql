-- Read models built by the tracker from the events stream. Disposable: `rollout admin rebuild`
-- truncates them and replays the log. Timestamps come from events, never now(), so a rebuild
-- produces identical rows.

create table if not exists projection_tracking (
    name text primary key,
    position bigint not null
);

create table if not exists environments (
    slug text not null,
    version int not null,
    spec_hash text not null,
    name text not null,
    template text not null,
    task_count int not null,
    spec jsonb not null,
    registered_at timestamptz not null,
    primary key (slug, version)
);

create table if not exists runs (
    run_id text primary key,
    name text,
    env_slug text not null,
    env_version int not null,
    env_hash text not null,
    model text not null,
    n int not null,
    split text,
    parent_run_id text,
    sampling jsonb not null,
    max_tool_calls int not null,
    policy_version int not null,
    status text not null,
    total int not null default 0,
    generated int not null default 0,
    scored int not null default 0,
    passed int not null default 0,
    errored int not null default 0,
    score_sum double precision not null default 0,
    reason text,
    created_at timestamptz not null,
    started_at timestamptz,
    finished_at timestamptz
);

create table if not exists rollouts (
    rollout_id text primary key,
    run_id text not null,
    task_index int not null,
    sample_index int not null,
    status text not null,
    model text not null,
    policy_version int not null,
    seed bigint,
    trajectory jsonb,
    trajectory_uri text,
    trajectory_sha256 text,
    score double precision,
    passed boolean,
    primitives jsonb,
    error text,
    generated_at timestamptz not null,
    scored_at timestamptz
);
create index if not exists rollouts_run on rollouts (run_id, task_index);

create table if not exists jobs (
    job_id text primary key,
    method text not null,
    base_model text not null,
    source_run_id text,
    env_slug text,
    suffix text,
    hyperparams jsonb not null,
    status text not null,
    step int not null default 0,
    total_steps int not null default 0,
    loss double precision,
    reward double precision,
    tokens_per_s double precision,
    eta_s double precision,
    model_id text,
    checkpoint_uri text,
    reason text,
    created_at timestamptz not null,
    updated_at timestamptz not null
);

create table if not exists checkpoints (
    job_id text not null,
    step int not null,
    uri text not null,
    sha256 text not null,
    size_bytes bigint not null,
    saved_at timestamptz not null,
    primary key (job_id, step)
);

create table if not exists policies (
    model text not null,
    version int not null,
    checkpoint_uri text not null,
    sha256 text not null,
    job_id text,
    updated_at timestamptz not null,
    primary key (model, version)
);

create table if not exists dead_letters (
    event_id text primary key,
    consumer text not null,
    stream text not null,
    stream_seq bigint not null,
    subject text not null,
    deliveries int not null,
    reason text not null,
    recorded_at timestamptz not null
);
