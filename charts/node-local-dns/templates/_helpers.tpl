{{/*
Names and labels. The chart's objects carry the release's name; the Pods also keep upstream's
k8s-app label, which dashboards and kubectl recipes written for upstream's manifest select by.
*/}}
{{- define "node-local-dns.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "node-local-dns.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/*
The DaemonSet's selector is k8s-app alone, as in upstream's manifest: a selector cannot change, so this
keeps `kubectl apply` over upstream's node-local-dns DaemonSet (or an older one of ours) working.
*/}}
{{- define "node-local-dns.selectorLabels" -}}
k8s-app: {{ include "node-local-dns.fullname" . }}
{{- end -}}

{{- define "node-local-dns.podLabels" -}}
{{ include "node-local-dns.selectorLabels" . }}
app.kubernetes.io/name: {{ include "node-local-dns.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "node-local-dns.labels" -}}
{{ include "node-local-dns.podLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "node-local-dns.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/*
Addresses, each given once in values.yaml. localIP and clusterDNS may be lists or comma-separated strings;
these helpers return them comma-separated, as node-cache's flags take them.
*/}}
{{- define "node-local-dns.list" -}}
{{- if kindIs "string" . -}}
{{- $items := list -}}
{{- range splitList "," . -}}{{- if trim . -}}{{- $items = append $items (trim .) -}}{{- end -}}{{- end -}}
{{- join "," $items -}}
{{- else -}}
{{- join "," . -}}
{{- end -}}
{{- end -}}

{{- define "node-local-dns.localIPs" -}}
{{- $ips := include "node-local-dns.list" .Values.localIP -}}
{{- if not $ips -}}{{- fail "localIP: give at least one node-local address" -}}{{- end -}}
{{- $ips -}}
{{- end -}}

{{- define "node-local-dns.clusterDNS" -}}
{{- $ips := include "node-local-dns.list" .Values.clusterDNS -}}
{{- if not $ips -}}{{- fail "clusterDNS: give the kube-dns Service's ClusterIPs" -}}{{- end -}}
{{- $ips -}}
{{- end -}}

{{/* The first local address: health, ready and the probes. */}}
{{- define "node-local-dns.probeIP" -}}
{{- first (splitList "," (include "node-local-dns.localIPs" .)) -}}
{{- end -}}

{{/* kube-proxy's mode, checked. */}}
{{- define "node-local-dns.mode" -}}
{{- $mode := .Values.kubeProxyMode -}}
{{- if not (has $mode (list "iptables" "nftables" "ipvs")) -}}
{{- fail (printf "kubeProxyMode: %q is not iptables, nftables or ipvs" $mode) -}}
{{- end -}}
{{- $mode -}}
{{- end -}}

{{/*
Whether the cache takes the kube-dns ClusterIPs over from kube-proxy's DNAT with NOTRACK rules: in iptables
and nftables mode (where it writes table inet nodelocaldns over netlink, found without configuration). In
IPVS mode the ClusterIP stays on kube-ipvs0.
*/}}
{{- define "node-local-dns.takesClusterIP" -}}
{{- if ne (include "node-local-dns.mode" .) "ipvs" -}}true{{- end -}}
{{- end -}}

{{/* What the cache binds: the local addresses, and the kube-dns ClusterIPs where it takes them over. */}}
{{- define "node-local-dns.listenIPs" -}}
{{- if include "node-local-dns.takesClusterIP" . -}}
{{- printf "%s,%s" (include "node-local-dns.localIPs" .) (include "node-local-dns.clusterDNS" .) -}}
{{- else -}}
{{- include "node-local-dns.localIPs" . -}}
{{- end -}}
{{- end -}}

{{/* Whether the cluster serves prometheus-operator's API, or the user forces the object. */}}
{{- define "node-local-dns.monitoringAPI" -}}
{{- $cfg := index . 1 -}}
{{- $ctx := index . 0 -}}
{{- if and $cfg.enabled (or $cfg.force ($ctx.Capabilities.APIVersions.Has "monitoring.coreos.com/v1")) -}}
true
{{- else if $cfg.enabled -}}
{{- fail (printf "%s.enabled: the cluster does not serve monitoring.coreos.com/v1 (install prometheus-operator's CRDs, or set %s.force=true)" (index . 2) (index . 2)) -}}
{{- end -}}
{{- end -}}

{{/* Label matchers of the cache's and the guard's scrape targets, for the alerts. */}}
{{- define "node-local-dns.cacheSelector" -}}
{{- .Values.prometheusRule.cacheSelector | default (printf "job=%q,endpoint=\"metrics\"" (include "node-local-dns.fullname" .)) -}}
{{- end -}}
{{- define "node-local-dns.guardSelector" -}}
{{- .Values.prometheusRule.guardSelector | default (printf "job=%q,endpoint=\"guard-metrics\"" (include "node-local-dns.fullname" .)) -}}
{{- end -}}

{{/*
A server block's wirecache, its only cache: at most .kib KiB of answers (its share of cacheMemoryMiB), an
entry count that lets the bytes bind first (one per 400 bytes), and serve_stale; corefile.Template's wireCache.
*/}}
{{- define "node-local-dns.wirecache" -}}
wirecache {
        capacity {{ div (mul .kib 1024) 400 }}
        max_memory {{ if eq (mod .kib 1024) 0 }}{{ div .kib 1024 }}MiB{{ else }}{{ .kib }}KiB{{ end }}
        serve_stale 1h 5s 1s
    }
{{- end -}}

{{/*
The Corefile template of the node-local-dns ConfigMap: corefile.Template of the configuration the values
describe (examples/kubernetes's tests check it). node-cache fills in the __PILLAR__ and __PROMETHEUS__
variables from its flags, adds notrack after every bind and turns `forward . __PILLAR__CLUSTER__DNS__`
into upstreamsvc.
*/}}
{{- define "node-local-dns.corefile" -}}
{{- $mib := int .Values.cacheMemoryMiB -}}
{{- $bind := "bind __PILLAR__LOCAL__DNS__" -}}
{{- if include "node-local-dns.takesClusterIP" . -}}
{{- $bind = "bind __PILLAR__LOCAL__DNS__ __PILLAR__DNS__SERVER__" -}}
{{- end -}}
{{ .Values.domain }}:53 {
    errors
    {{ include "node-local-dns.wirecache" (dict "kib" (div (mul $mib 1024 10) 16)) }}
    clamp {
        success 5 30
        denial 5 5
    }
    reload
    loop
    {{ $bind }}
    forward . __PILLAR__CLUSTER__DNS__ {
        force_tcp
    }
    prometheus __PROMETHEUS__ENDPOINT__
    health __PILLAR__LOCAL__DNS__:{{ .Values.ports.health }}
    ready __PILLAR__LOCAL__DNS__:{{ .Values.ports.ready }}
}
{{- range list "in-addr.arpa" "ip6.arpa" }}

{{ . }}:53 {
    errors
    {{ include "node-local-dns.wirecache" (dict "kib" (div (mul $mib 1024) 16)) }}
    clamp {
        success 5 30
        denial 5 30
    }
    reload
    loop
    {{ $bind }}
    forward . __PILLAR__CLUSTER__DNS__ {
        force_tcp
    }
    prometheus __PROMETHEUS__ENDPOINT__
}
{{- end }}

.:53 {
    errors
    {{ include "node-local-dns.wirecache" (dict "kib" (div (mul $mib 1024 4) 16)) }}
    clamp {
        success 5 30
        denial 5 30
    }
    reload
    loop
    {{ $bind }}
    forward . __PILLAR__UPSTREAM__SERVERS__
    prometheus __PROMETHEUS__ENDPOINT__
}
{{ end -}}
