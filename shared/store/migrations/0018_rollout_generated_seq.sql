-- The stream position of the rollout.generated event a row's trajectory came from: a verdict
-- is applied only to the trajectory it judged (rollout.scored names it), when a rollout was
-- generated twice. Rows applied before this column read null (any verdict, as before).
alter table rollouts add column if not exists generated_seq bigint;
