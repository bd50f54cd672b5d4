package jobs

import (
	"context"
	"encoding/json"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/platform/pg"
	"github.com/bettercompute/bettercompute/platform/tracing"
)

var (
	inserterOnce sync.Once
	inserter     *river.Client[pgx.Tx]
	inserterErr  error
)

// InsertTx inserts a River job in the caller's transaction: if tx rolls back, so
// does the job. It needs no running client (domain code and applications use it
// inside their own transactions); worker processes pick the job up by its queue.
//
// A job of a fenced kind (registered with workers.AddWorker: worked only in
// shard queues, fenced by the shard's lease) must go to a shard queue; insert
// it with InsertForKeyTx. Inserted anywhere else (River's default queue, where
// no worker would ever take it) it is refused with INVALID_ARGUMENT, by the
// database, whatever the insert path.
//
// Args whose JSON PostgreSQL's jsonb refuses (a string holding a NUL byte,
// which encoding/json writes as \u0000), and opts.Metadata that is not such
// JSON, are INVALID_ARGUMENT before any statement is sent (fault.CheckJSON):
// the insert would fail and abort tx.
//
// When ctx has a sampled span (the application's request, traced), the job's
// metadata records it as "traceparent", so the job's work span is in the
// request's trace (docs/operating.md, "One trace from the request to the delivery").
// When ctx names a tenant (WithTenant), the metadata records it as "tenant",
// after UseTenantTx's check (a deleted tenant's job is CONFLICT).
func InsertTx(ctx context.Context, tx pgx.Tx, args river.JobArgs, opts *river.InsertOpts) (*rivertype.JobInsertResult, error) {
	inserterOnce.Do(func() {
		inserter, inserterErr = river.NewClient(riverpgxv5.New(nil), &river.Config{
			Middleware: []rivertype.Middleware{&checkJSON{}},
		})
	})
	if inserterErr != nil {
		return nil, inserterErr
	}
	cause, tenant := tracing.Cause(ctx), TenantOf(ctx)
	if cause != "" || tenant != "" {
		o := river.InsertOpts{}
		if opts != nil {
			o = *opts
		}
		md := o.Metadata
		var err error
		if cause != "" {
			if md, err = withMetadata(md, TraceparentKey, cause); err != nil {
				return nil, invalid("InsertTx: opts.Metadata is not a JSON object: %v", err)
			}
		}
		if tenant != "" {
			if md, err = withMetadata(md, TenantKey, tenant); err != nil {
				return nil, invalid("InsertTx: opts.Metadata is not a JSON object: %v", err)
			}
			if err := UseTenantTx(ctx, tx, tenant); err != nil {
				return nil, err
			}
		}
		o.Metadata = md
		opts = &o
	}
	res, err := inserter.InsertTx(ctx, tx, args, opts)
	if err != nil {
		return nil, pg.Translate(err)
	}
	return res, nil
}

// checkJSON is the inserter's middleware that refuses args and metadata the
// insert's jsonb columns would refuse (fault.CheckJSON), on the JSON River
// encoded once for the insert, before its statement is sent.
type checkJSON struct{ river.MiddlewareDefaults }

func (*checkJSON) InsertMany(ctx context.Context, many []*rivertype.JobInsertParams, doInner func(context.Context) ([]*rivertype.JobInsertResult, error)) ([]*rivertype.JobInsertResult, error) {
	for _, p := range many {
		if err := fault.CheckJSON("InsertTx: the args of job "+p.Kind, p.EncodedArgs); err != nil {
			return nil, err
		}
		if len(p.Metadata) == 0 {
			continue
		}
		if !json.Valid(p.Metadata) {
			return nil, invalid("InsertTx: opts.Metadata is not JSON")
		}
		if err := fault.CheckJSON("InsertTx: opts.Metadata", p.Metadata); err != nil {
			return nil, err
		}
	}
	return doInner(ctx)
}

// ShardCountTx reads the deployment's shard count in tx.
func ShardCountTx(ctx context.Context, tx pgx.Tx) (int, error) {
	var n int
	err := tx.QueryRow(ctx, `SELECT shard_count FROM compute_settings`).Scan(&n)
	return n, err
}

// ShardQueueOfTx is the shard queue of key, read in tx.
func ShardQueueOfTx(ctx context.Context, tx pgx.Tx, key string) (string, error) {
	n, err := ShardCountTx(ctx, tx)
	if err != nil {
		return "", err
	}
	return ShardQueue(ShardOf(key, n)), nil
}
