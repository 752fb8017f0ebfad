package series

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	dto "github.com/prometheus/client_model/go"
)

func TestSlotResolvesOnce(t *testing.T) {
	vec := promauto.With(nil).NewCounterVec(prometheus.CounterOpts{Name: "test_total", Help: "test"}, []string{"server"}) // not registered
	var s Slot[prometheus.Counter]
	resolved := 0
	for range 3 {
		s.Get(func() prometheus.Counter {
			resolved++
			return vec.WithLabelValues("a")
		}).Inc()
	}
	if resolved != 1 {
		t.Errorf("resolved %d times, want once", resolved)
	}
	var m dto.Metric
	if err := vec.WithLabelValues("a").Write(&m); err != nil {
		t.Fatal(err)
	}
	if got := m.GetCounter().GetValue(); got != 3 {
		t.Errorf("the vector's child counted %v, want 3: the kept child is not the one it exports", got)
	}
}

func TestPerServer(t *testing.T) {
	var s PerServer[string]
	made := map[string]int{}
	for _, server := range []string{"dns://a:53", "dns://b:53", "dns://a:53", "dns://c:53", "dns://b:53", "dns://a:53"} {
		if got := s.Get(server, func() string { made[server]++; return "for " + server }); got != "for "+server {
			t.Errorf("Get(%q) = %q", server, got)
		}
	}
	for server, n := range made {
		if n != 1 {
			t.Errorf("%s made %d times, want once", server, n)
		}
	}
	if len(made) != 3 {
		t.Errorf("made values for %d servers, want 3", len(made))
	}
}

func TestPerServerRacingGetsMakeOnce(t *testing.T) {
	var s PerServer[*int]
	var made atomic.Int32
	var wg sync.WaitGroup
	got := make([]*int, 32)
	for i := range got {
		wg.Go(func() {
			got[i] = s.Get(fmt.Sprintf("dns://%d:53", i%4), func() *int { made.Add(1); return new(int) })
		})
	}
	wg.Wait()
	if n := made.Load(); n != 4 {
		t.Errorf("made %d values for 4 servers", n)
	}
	for i := range got {
		if got[i] != got[i%4] {
			t.Errorf("goroutine %d got another value than goroutine %d for the same server", i, i%4)
		}
	}
}
