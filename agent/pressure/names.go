package pressure

import (
	"regexp"
	"sort"

	"github.com/prometheus/client_golang/prometheus"
)

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// MetricNames lists the metrics the collector can export, whichever sources
// are in use, so that dashboards and alerts can be checked against them.
func MetricNames() []string {
	descs := []*prometheus.Desc{descPeriods, descThrottled, descThrotSec, descOOM, descRunq, descReclaim, descReclaims, descErr, descSource, descProgRuns, descProgTime, descCPULimit, descMemLimit}
	for _, d := range descPSI {
		descs = append(descs, d[0], d[1])
	}
	var names []string
	for _, d := range descs {
		// Desc keeps its name unexported; its String form is stable API text.
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			names = append(names, m[1])
		}
	}
	sort.Strings(names)
	return names
}
