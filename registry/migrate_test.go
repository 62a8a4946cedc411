package registry

import (
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"
)

// oldDatabase makes a database as den left it at schema version steps
// (the first steps of schema applied), holding rows, and returns its
// path: what a migration test opens.
func oldDatabase(t *testing.T, steps int, rows ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "den.db")
	raw, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	for _, q := range append(append(sqliteSchema[:steps:steps], fmt.Sprintf("PRAGMA user_version = %d", steps)), rows...) {
		if _, err := raw.Exec(q); err != nil {
			t.Fatalf("old database: %v\n%s", err, q)
		}
	}
	return path
}
