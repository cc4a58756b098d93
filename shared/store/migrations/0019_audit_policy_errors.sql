-- The policies that crashed during an audit (one line each): such an audit is incomplete, and
-- the viewer says so rather than "no task hackable". Audits recorded before read none.
alter table env_audits add column if not exists policy_errors jsonb not null default '[]'::jsonb;
