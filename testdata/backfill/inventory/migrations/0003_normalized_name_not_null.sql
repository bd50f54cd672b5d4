-- Release 4, clean up: normalized_name is required, and the expand stage's
-- trigger and index go (release 3, the cut-over, writes the column itself).
--
-- A new file, never an edit of 0002. It applies only once the backfill has
-- finished: a row still without the column stops it here with a clear error, and
-- the ledger records nothing, so the next start tries again.
DO $body$
DECLARE
    missing bigint;
BEGIN
    SELECT count(*) INTO missing FROM inventory_items WHERE normalized_name IS NULL;
    IF missing > 0 THEN
        RAISE EXCEPTION 'inventory_items: % rows have no normalized_name yet: the backfill inventory_normalized_name has not finished (better-compute backfill status inventory_normalized_name)', missing
            USING ERRCODE = '55000';
    END IF;
END
$body$;

ALTER TABLE inventory_items ALTER COLUMN normalized_name SET NOT NULL;
DROP TRIGGER inventory_items_normalize ON inventory_items;
DROP FUNCTION inventory_items_normalize();
DROP INDEX inventory_items_unnormalized;
