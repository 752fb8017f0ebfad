package upstreamsvc

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
)

// fakeAPI is a Kubernetes API server that knows one namespace and at most one Service, enough for
// client-go's list, watch and watch-list (sendInitialEvents) requests. It records any request that
// is not limited to that one Service.
type fakeAPI struct {
	t         *testing.T
	srv       *httptest.Server
	namespace string
	name      string

	mu          sync.Mutex
	rv          int
	svc         *corev1.Service
	events      []fakeEvent
	changed     chan struct{} // closed and replaced on every event
	unavailable bool
	openWatches int
	watchesSeen int
	offTarget   []string
}

type fakeEvent struct {
	rv  int
	typ watch.EventType
	svc corev1.Service
}

func newFakeAPI(t *testing.T, namespace, name string) *fakeAPI {
	f := &fakeAPI{t: t, namespace: namespace, name: name, rv: 1, changed: make(chan struct{})}
	f.srv = httptest.NewServer(f)
	t.Cleanup(func() {
		f.mu.Lock()
		off := f.offTarget
		f.mu.Unlock()
		for _, r := range off {
			t.Errorf("request not limited to Service %s/%s: %s", namespace, name, r)
		}
		f.srv.CloseClientConnections()
		f.srv.Close()
	})
	return f
}

// setService creates or updates the Service with clusterIPs and a dns-tcp port.
func (f *fakeAPI) setService(clusterIPs []string, port int32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	typ := watch.Modified
	if f.svc == nil {
		typ = watch.Added
	}
	f.rv++
	f.svc = &corev1.Service{
		TypeMeta:   metav1.TypeMeta{Kind: "Service", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Name: f.name, Namespace: f.namespace, ResourceVersion: strconv.Itoa(f.rv)},
		Spec: corev1.ServiceSpec{
			Type:       corev1.ServiceTypeClusterIP,
			ClusterIP:  clusterIPs[0],
			ClusterIPs: clusterIPs,
			Ports: []corev1.ServicePort{
				{Name: "dns", Protocol: corev1.ProtocolUDP, Port: port},
				{Name: dnsTCPPortName, Protocol: corev1.ProtocolTCP, Port: port},
			},
		},
	}
	f.record(typ, *f.svc)
}

func (f *fakeAPI) deleteService() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.svc == nil {
		return
	}
	f.rv++
	gone := *f.svc
	gone.ResourceVersion = strconv.Itoa(f.rv)
	f.svc = nil
	f.record(watch.Deleted, gone)
}

func (f *fakeAPI) setUnavailable(v bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unavailable = v
}

func (f *fakeAPI) watches() (open, seen int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.openWatches, f.watchesSeen
}

// record appends an event and wakes the watches. Called with f.mu held.
func (f *fakeAPI) record(typ watch.EventType, svc corev1.Service) {
	f.events = append(f.events, fakeEvent{rv: f.rv, typ: typ, svc: svc})
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f.mu.Lock()
	if r.URL.Path != "/api/v1/namespaces/"+f.namespace+"/services" || q.Get("fieldSelector") != "metadata.name="+f.name {
		f.offTarget = append(f.offTarget, r.Method+" "+r.URL.String())
		f.mu.Unlock()
		http.Error(w, "off target", http.StatusForbidden)
		return
	}
	if f.unavailable {
		f.mu.Unlock()
		f.writeStatus(w, http.StatusServiceUnavailable, "ServiceUnavailable")
		return
	}
	if q.Get("watch") != "true" {
		list := corev1.ServiceList{
			TypeMeta: metav1.TypeMeta{Kind: "ServiceList", APIVersion: "v1"},
			ListMeta: metav1.ListMeta{ResourceVersion: strconv.Itoa(f.rv)},
		}
		if f.svc != nil {
			list.Items = append(list.Items, *f.svc)
		}
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(list)
		return
	}
	f.serveWatch(w, r) // unlocks f.mu
}

// serveWatch streams events. With sendInitialEvents it first sends the current Service and the
// initial-events-end bookmark, as kube-apiserver does for client-go's watch-list.
func (f *fakeAPI) serveWatch(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	from, _ := strconv.Atoi(q.Get("resourceVersion"))
	var initial []metav1.WatchEvent
	if q.Get("sendInitialEvents") == "true" {
		if f.svc != nil {
			initial = append(initial, f.watchEvent(watch.Added, *f.svc))
		}
		initial = append(initial, f.watchEvent(watch.Bookmark, corev1.Service{
			TypeMeta: metav1.TypeMeta{Kind: "Service", APIVersion: "v1"},
			ObjectMeta: metav1.ObjectMeta{
				ResourceVersion: strconv.Itoa(f.rv),
				Annotations:     map[string]string{metav1.InitialEventsAnnotationKey: "true"},
			},
		}))
		from = f.rv
	}
	f.openWatches++
	f.watchesSeen++
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.openWatches--
		f.mu.Unlock()
	}()

	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	flusher := w.(http.Flusher)
	for _, ev := range initial {
		enc.Encode(ev)
	}
	flusher.Flush()
	for {
		f.mu.Lock()
		var pending []metav1.WatchEvent
		for _, ev := range f.events {
			if ev.rv > from {
				pending = append(pending, f.watchEvent(ev.typ, ev.svc))
				from = ev.rv
			}
		}
		changed := f.changed
		f.mu.Unlock()
		for _, ev := range pending {
			if err := enc.Encode(ev); err != nil {
				return
			}
		}
		flusher.Flush()
		select {
		case <-changed:
		case <-r.Context().Done():
			return
		}
	}
}

func (f *fakeAPI) watchEvent(typ watch.EventType, svc corev1.Service) metav1.WatchEvent {
	raw, err := json.Marshal(svc)
	if err != nil {
		f.t.Errorf("encoding Service: %v", err)
	}
	return metav1.WatchEvent{Type: string(typ), Object: runtime.RawExtension{Raw: raw}}
}

func (f *fakeAPI) writeStatus(w http.ResponseWriter, code int, reason metav1.StatusReason) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure,
		Reason:   reason,
		Code:     int32(code),
	})
}
