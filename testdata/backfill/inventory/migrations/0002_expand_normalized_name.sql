-- Release 2, expand: a nullable column. ADD COLUMN without a default rewrites
-- nothing, so this is quick whatever the table's size. Filling the column for the
-- rows that exist is the backfill inventory_normalized_name, never this file.
ALTER TABLE inventory_items ADD COLUMN normalized_name text;

-- Release 1 keeps running during the rollout and writes rows without the column:
-- this trigger fills it for every row written from now on (and keeps it right
-- when release 1 renames an item), so the backfill has only the rows that were
-- there before, and nothing arrives after it has passed.
CREATE FUNCTION inventory_items_normalize() RETURNS trigger
    LANGUAGE plpgsql
    AS $body$
BEGIN
    NEW.normalized_name := lower(NEW.name);
    RETURN NEW;
END
$body$;

CREATE TRIGGER inventory_items_normalize BEFORE INSERT OR UPDATE OF name ON inventory_items
    FOR EACH ROW EXECUTE FUNCTION inventory_items_normalize();

-- The backfill's batches find the rows left through this index, so the last
-- batch costs what the first did (without it each batch scans past every row
-- already done). Building it reads the table once.
CREATE INDEX inventory_items_unnormalized ON inventory_items (id) WHERE normalized_name IS NULL;
