//go:build linux

package main

import (
	"testing"
	"testing/fstest"
)

func TestCgroupMemoryLimit(t *testing.T) {
	for _, tc := range []struct {
		name      string
		files     map[string]string
		want      int64
		wantFound bool
		wantErr   bool
	}{
		{
			name: "v2 in a cgroup namespace",
			files: map[string]string{
				"proc/self/cgroup":         "0::/\n",
				"sys/fs/cgroup/memory.max": "67108864\n",
			},
			want: 64 << 20, wantFound: true,
		},
		{
			name: "v2 without a cgroup namespace reads the process's own cgroup",
			files: map[string]string{
				"proc/self/cgroup":                          "0::/kubepods/pod1/c1\n",
				"sys/fs/cgroup/kubepods/pod1/c1/memory.max": "33554432\n",
				"sys/fs/cgroup/memory.max":                  "max\n",
			},
			want: 32 << 20, wantFound: true,
		},
		{
			name: "v2 path not mounted falls back to the top",
			files: map[string]string{
				"proc/self/cgroup":         "0::/kubepods/pod1/c1\n",
				"sys/fs/cgroup/memory.max": "100663296\n",
			},
			want: 96 << 20, wantFound: true,
		},
		{
			name: "v2 no limit",
			files: map[string]string{
				"proc/self/cgroup":         "0::/\n",
				"sys/fs/cgroup/memory.max": "max\n",
			},
		},
		{
			name: "v1",
			files: map[string]string{
				"proc/self/cgroup":                           "12:pids:/a\n11:memory:/kubepods/x\n1:name=systemd:/a\n",
				"sys/fs/cgroup/memory/memory.limit_in_bytes": "134217728\n",
			},
			want: 128 << 20, wantFound: true,
		},
		{
			name: "v1 no limit",
			files: map[string]string{
				"proc/self/cgroup":                           "4:memory:/\n",
				"sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
			},
		},
		{
			name:  "no memory controller mounted",
			files: map[string]string{"proc/self/cgroup": "0::/\n"},
		},
		{
			name: "garbage",
			files: map[string]string{
				"proc/self/cgroup":         "0::/\n",
				"sys/fs/cgroup/memory.max": "lots\n",
			},
			wantErr: true,
		},
		{name: "no /proc", files: map[string]string{}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fsys := fstest.MapFS{}
			for name, content := range tc.files {
				fsys[name] = &fstest.MapFile{Data: []byte(content)}
			}
			got, found, err := cgroupMemoryLimit(fsys)
			if (err != nil) != tc.wantErr {
				t.Fatalf("error %v, want error: %v", err, tc.wantErr)
			}
			if got != tc.want || found != tc.wantFound {
				t.Errorf("got %d, %v; want %d, %v", got, found, tc.want, tc.wantFound)
			}
		})
	}
}

func TestGCPercent(t *testing.T) {
	unset := func(string) (string, bool) { return "", false }
	if percent, set := gcPercent(unset); !set || percent != 50 {
		t.Errorf("without GOGC: %d, %v; want 50, true", percent, set)
	}
	for _, v := range []string{"100", "off", ""} {
		lookup := func(name string) (string, bool) { return v, name == "GOGC" }
		if _, set := gcPercent(lookup); set {
			t.Errorf("GOGC=%q was overridden", v)
		}
	}
}
