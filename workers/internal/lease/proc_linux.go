package lease

import (
	"os"
	"strconv"
	"strings"
)

// thisProcess describes the calling process: its boot id and start time name it
// on this host, so a later process can tell whether it still runs.
func thisProcess() procID {
	return procID{pid: os.Getpid(), bootID: bootID(), start: procStart(os.Getpid())}
}

func bootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// procStart is field 22 of /proc/PID/stat, the process's start time in clock
// ticks since boot, or 0 when there is no such process.
func procStart(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:]) // field 3 onwards
	if len(f) < 20 {
		return 0
	}
	n, err := strconv.ParseInt(f[19], 10, 64)
	if err != nil {
		return 0
	}
	return n
}

// running reports whether the process p recorded is still running: same boot,
// same pid, same start time (a reused pid has another). ok is false when this
// host cannot tell (another boot, or no /proc).
func (p procID) running() (alive, ok bool) {
	me := thisProcess()
	if p.bootID == "" || p.start == 0 || me.bootID == "" || p.bootID != me.bootID {
		return false, false
	}
	return procStart(p.pid) == p.start, true
}
