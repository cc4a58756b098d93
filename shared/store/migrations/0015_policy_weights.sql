-- The digest of each policy version's weights (shared/models/weights_proof.py): the viewer
-- shows whether a rollout was generated with the weights of the version it claims.
alter table policies add column if not exists weights_sha256 text;
