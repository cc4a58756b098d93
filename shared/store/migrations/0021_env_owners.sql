-- Who owns each environment slug (the NATS user whose push registered its first version:
-- services/env_registry); null for versions registered before owners were kept.
alter table environments add column if not exists owner text;
