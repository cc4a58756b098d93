-- Typed outcomes: what broke when a rollout errored (infra / env / model).
alter table rollouts add column if not exists error_kind text;
