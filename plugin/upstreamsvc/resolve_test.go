package upstreamsvc

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestAPISet(t *testing.T) {
	svc := func(typ corev1.ServiceType, clusterIP string, clusterIPs []string, ports ...corev1.ServicePort) *corev1.Service {
		return &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "kube-dns-upstream", Namespace: "kube-system"},
			Spec:       corev1.ServiceSpec{Type: typ, ClusterIP: clusterIP, ClusterIPs: clusterIPs, Ports: ports},
		}
	}
	udp53 := corev1.ServicePort{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53}
	tcp53 := corev1.ServicePort{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 53}
	dnsTCP := corev1.ServicePort{Name: "dns-tcp", Protocol: corev1.ProtocolTCP, Port: 1053}

	tests := []struct {
		name       string
		svc        *corev1.Service
		configPort uint16
		want       []string
		wantErr    string
	}{
		{name: "dns-tcp port", svc: svc("", "10.96.0.11", nil, udp53, dnsTCP), want: []string{"10.96.0.11:1053"}},
		{name: "TCP 53 without name", svc: svc("", "10.96.0.11", nil, udp53, tcp53), want: []string{"10.96.0.11:53"}},
		{name: "no TCP port", svc: svc("", "10.96.0.11", nil, udp53), want: []string{"10.96.0.11:53"}},
		{name: "Corefile port wins", svc: svc("", "10.96.0.11", nil, dnsTCP), configPort: 5300, want: []string{"10.96.0.11:5300"}},
		{
			name: "dual-stack, primary first",
			svc:  svc(corev1.ServiceTypeClusterIP, "fd00:10:96::11", []string{"fd00:10:96::11", "10.96.0.11"}, dnsTCP),
			want: []string{"[fd00:10:96::11]:1053", "10.96.0.11:1053"},
		},
		{name: "headless", svc: svc("", "None", []string{"None"}), wantErr: "headless"},
		{name: "no ClusterIP", svc: svc("", "", nil), wantErr: "has no ClusterIP"},
		{name: "ExternalName", svc: svc(corev1.ServiceTypeExternalName, "", nil), wantErr: "ExternalName"},
		{name: "garbage ClusterIP", svc: svc("", "10.96.0.300", nil), wantErr: `"10.96.0.300" is not an IP address`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := viewOf(tc.svc)
			if tc.wantErr != "" {
				if v.problem == nil || !strings.Contains(v.problem.Error(), tc.wantErr) {
					t.Fatalf("problem %v, want one containing %q", v.problem, tc.wantErr)
				}
				return
			}
			if v.problem != nil {
				t.Fatal(v.problem)
			}
			cfg := Config{Port: tc.configPort}
			if got := cfg.apiSet(v); !slices.Equal(got.addrs, tc.want) || got.source != sourceAPI {
				t.Errorf("got %+v, want %v from the API", got, tc.want)
			}
		})
	}
}

func TestEnvVarNames(t *testing.T) {
	if got := HostEnvVar("kube-dns-upstream"); got != "KUBE_DNS_UPSTREAM_SERVICE_HOST" {
		t.Errorf("HostEnvVar = %s", got)
	}
	if got := portEnvVar("kube-dns-upstream"); got != "KUBE_DNS_UPSTREAM_SERVICE_PORT_DNS_TCP" {
		t.Errorf("portEnvVar = %s", got)
	}
}

func TestEnvAddress(t *testing.T) {
	tests := []struct {
		env       map[string]string
		want      string
		wantFound bool
		wantErr   bool
	}{
		{env: map[string]string{}},
		{env: map[string]string{"KUBE_DNS_UPSTREAM_SERVICE_HOST": "10.96.0.11"}, want: "10.96.0.11:53", wantFound: true},
		{env: map[string]string{"KUBE_DNS_UPSTREAM_SERVICE_HOST": "fd00::11", "KUBE_DNS_UPSTREAM_SERVICE_PORT_DNS_TCP": "5353"},
			want: "[fd00::11]:5353", wantFound: true},
		{env: map[string]string{"KUBE_DNS_UPSTREAM_SERVICE_HOST": "<nil>"}, wantErr: true},
	}
	for _, tc := range tests {
		got, found, err := EnvAddress("kube-dns-upstream", func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })
		if got != tc.want || found != tc.wantFound || (err != nil) != tc.wantErr {
			t.Errorf("EnvAddress with %v = %q, %v, %v; want %q, %v, error %v", tc.env, got, found, err, tc.want, tc.wantFound, tc.wantErr)
		}
	}
}
