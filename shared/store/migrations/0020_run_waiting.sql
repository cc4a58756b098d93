-- A run's work items and how many are queued (null: all of them at its start), and when its
-- deadline counts from: its request, or, for a run that waited for its owner's earlier runs
-- (ROLLOUT_RUNS_PER_OWNER), its first release (null while it waits).
alter table runs add column if not exists work_items int;
alter table runs add column if not exists released int;
alter table runs add column if not exists deadline_from timestamptz;
update runs set deadline_from = created_at where deadline_from is null and released is null;
-- The leader looks for windowed runs it does not hold, and for the runs that wait, every few
-- seconds: both are few, whatever the number of runs kept.
create index if not exists runs_releasing on runs (owner, created_at)
    where status in ('queued', 'running') and released < work_items;
