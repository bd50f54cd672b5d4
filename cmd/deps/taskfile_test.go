package main

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// TestTasksCallDepsWithoutTheirArguments: a task that runs deps first passes
// it an empty CLI_ARGS. Task hands the caller's arguments (those after --) to
// the tasks it calls, so `go tool task torture -- -runs 50` once ran
// `deps -runs 50`, which refused the flag and stopped the torture run before
// it began.
func TestTasksCallDepsWithoutTheirArguments(t *testing.T) {
	raw, err := os.ReadFile("../../Taskfile.yml")
	require.NoError(t, err)
	var tf struct {
		Tasks map[string]struct {
			Cmds []any `yaml:"cmds"`
		} `yaml:"tasks"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &tf))
	calls := 0
	for name, task := range tf.Tasks {
		for _, c := range task.Cmds {
			m, ok := c.(map[string]any)
			if !ok || m["task"] != "deps" {
				continue
			}
			calls++
			vars, _ := m["vars"].(map[string]any)
			args, set := vars["CLI_ARGS"]
			require.True(t, set && args == "", "task %s calls deps without vars: {CLI_ARGS: \"\"}", name)
		}
	}
	require.GreaterOrEqual(t, calls, 6, "the tasks that run deps first: dev, test, bench, bench:report, chaos, torture")
}
