package store

import (
	"context"
	"fmt"
)

func openPostgres(ctx context.Context, conn string, opts Options) (Store, error) {
	return nil, fmt.Errorf("store: %s: PostgreSQL is not supported by this build yet", Redact(conn))
}
