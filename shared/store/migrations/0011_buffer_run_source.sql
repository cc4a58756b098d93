-- Where a buffered run's verdicts came from: null for the platform's own verifier, else the
-- importer's name ('art': rewards recorded elsewhere, not checked here), from
-- run.requested.source. Rows applied before this column read null until a rebuild.
alter table buffer_runs add column if not exists source text;
