-- A run's budget overrides (null: the env's, else the platform's) and, for an imported run, where
-- its rewards came from ('art': recorded elsewhere, not verified here); from run.requested.
-- Rows applied before these columns read null until a rebuild.
alter table runs add column if not exists budgets jsonb;
alter table runs add column if not exists source text;
