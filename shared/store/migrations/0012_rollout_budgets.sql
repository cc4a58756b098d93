-- Which budget ended each rollout (null: the model ended it), and its model turns and tokens.
alter table rollouts add column if not exists ended_by text;
alter table rollouts add column if not exists turns int;
alter table rollouts add column if not exists completion_tokens int;
