-- A run's score sum is exact: a float sum depends on how the verdicts were grouped (the live
-- projection's batches, a rebuild's single events), so a rebuild gave other rows. Rows summed
-- as floats before this keep their value to 15 digits; `rollout admin rebuild` makes them exact.
alter table runs alter column score_sum type numeric using score_sum::numeric;
