-- Who started each run and job (the NATS user its request came from: shared/auth/ownership.py);
-- null for those recorded before owners were kept.
alter table runs add column if not exists owner text;
alter table jobs add column if not exists owner text;
