-- Runs time out with a reason; the tracker checks this deadline.
alter table runs add column if not exists deadline_s double precision not null default 3600;
alter table runs add column if not exists task_count int not null default 0;
