package kubernetes

import (
	"encoding/json"
	"fmt"
)

// Dashboard is the part of the chart's Grafana dashboard (charts/node-local-dns/files/dashboard.json) that
// its checks read: each panel's queries and the template variables.
type Dashboard struct {
	Panels []struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Type       string `json:"type"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

// ParseDashboard reads a Grafana dashboard's JSON.
func ParseDashboard(data []byte) (*Dashboard, error) {
	d := new(Dashboard)
	if err := json.Unmarshal(data, d); err != nil {
		return nil, fmt.Errorf("reading the dashboard's JSON: %w", err)
	}
	return d, nil
}
