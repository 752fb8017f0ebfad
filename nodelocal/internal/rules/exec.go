//go:build linux

package rules

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// CommandError is a failed iptables, iptables-save or iptables-restore run.
type CommandError struct {
	// Args is the command line.
	Args []string
	// ExitStatus is the exit status, or -1 when the command did not exit on its own (not started, killed
	// when the context ended).
	ExitStatus int
	// Stderr is what the command wrote to standard error.
	Stderr string
	// Err is the error from running the command.
	Err error
}

func (e *CommandError) Error() string {
	msg := strings.Join(e.Args, " ")
	if e.ExitStatus >= 0 {
		msg += fmt.Sprintf(": exit status %d", e.ExitStatus)
	} else {
		msg += ": " + e.Err.Error()
	}
	if s := strings.TrimSpace(e.Stderr); s != "" {
		msg += ": " + strings.Join(strings.Fields(s), " ")
	}
	return msg
}

func (e *CommandError) Unwrap() error { return e.Err }

// LockContention reports whether the command gave up waiting for the xtables lock that another program
// held (iptables-legacy exits with status 4 and says so).
func (e *CommandError) LockContention() bool {
	return e.ExitStatus == 4 && (strings.Contains(e.Stderr, "xtables lock") || strings.Contains(e.Stderr, "Another app is currently holding"))
}

// IsLockContention reports whether err comes from a command that could not get the xtables lock in time.
func IsLockContention(err error) bool {
	var ce *CommandError
	return errors.As(err, &ce) && ce.LockContention()
}

// runner runs one command to completion.
type runner interface {
	run(ctx context.Context, stdin []byte, name string, args ...string) ([]byte, error)
}

// execRunner runs commands as child processes that end with the context.
type execRunner struct{}

func (execRunner) run(ctx context.Context, stdin []byte, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	// A killed iptables may leave a grandchild holding the pipes; do not wait for it for long.
	cmd.WaitDelay = time.Second
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err == nil {
		return stdout.Bytes(), nil
	}
	ce := &CommandError{Args: append([]string{name}, args...), ExitStatus: -1, Stderr: stderr.String(), Err: err}
	if cerr := ctx.Err(); cerr != nil {
		// Killed because the context ended: report that, not the signal.
		ce.Err = fmt.Errorf("%w (%v)", cerr, err)
	} else {
		if ee, ok := errors.AsType[*exec.ExitError](err); ok {
			ce.ExitStatus = ee.ExitCode()
		}
	}
	return stdout.Bytes(), ce
}
