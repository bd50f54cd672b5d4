package migrations

import (
	"io/fs"
	"os"
	"path"
	"testing"
)

// TestEverySQLFileIsEmbedded: FS and Demo name their owners one by one, so a
// new owner's directory must be added to one of them; this fails until it is,
// and when a directory is in both or Owners and FS disagree.
func TestEverySQLFileIsEmbedded(t *testing.T) {
	t.Parallel()
	onDisk, err := fs.Glob(os.DirFS("."), "*/*.sql")
	if err != nil {
		t.Fatal(err)
	}
	inFS, _ := fs.Glob(FS, "*/*.sql")
	inDemo, _ := fs.Glob(Demo, "*/*.sql")
	embedded := map[string]int{}
	for _, f := range append(inFS, inDemo...) {
		embedded[f]++
	}
	for _, f := range onDisk {
		switch embedded[f] {
		case 0:
			t.Errorf("%s is in neither FS nor Demo: add its owner to a //go:embed line in embed.go", f)
		case 2:
			t.Errorf("%s is in both FS and Demo", f)
		}
	}
	owners := map[string]bool{}
	for _, o := range Owners {
		owners[o] = true
	}
	for _, f := range inFS {
		if !owners[path.Dir(f)] {
			t.Errorf("%s: owner %s is embedded in FS but missing from Owners", f, path.Dir(f))
		}
	}
	if len(inFS) == 0 || len(inDemo) == 0 {
		t.Fatalf("nothing embedded: FS %d files, Demo %d", len(inFS), len(inDemo))
	}
}
