-- Each audit the registry ran on an env version (`rollout audit --platform`): the viewer's env
-- page shows the last one, its hackable tasks and findings (policy, primitive, fix).
create table if not exists env_audits (
    event_id text primary key,
    slug text not null,
    version int not null,
    split text,
    threshold double precision not null,
    tasks int not null,
    policies jsonb not null,
    hackable_tasks jsonb not null,
    findings jsonb not null,
    findings_total int not null,
    errors int not null,
    seconds double precision not null,
    audited_at timestamptz not null
);
create index if not exists env_audits_slug on env_audits (slug, audited_at desc);
