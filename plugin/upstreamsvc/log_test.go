package upstreamsvc

import (
	"io"
	"strings"
	"sync"
	"testing"

	clog "github.com/coredns/coredns/plugin/pkg/log"
)

func init() { clog.Discard() }

// logBuffer records what the plugin logs, for tests that need evidence an event reached it.
type logBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// captureLog sends the log to a buffer until the test ends, then discards it again.
func captureLog(t *testing.T) *logBuffer {
	t.Helper()
	l := &logBuffer{}
	clog.SetOutput(l)
	t.Cleanup(func() { clog.SetOutput(io.Discard) })
	return l
}
