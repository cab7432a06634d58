package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// JournalStats are the journal's figures at one scrape (agent/journal's
// Stats, in the terms an operator alerts on).
type JournalStats struct {
	SizeBytes   int64
	Intents     int
	Compactions int
	// CompactionFailed: the last compaction failed, so the file keeps
	// growing until one succeeds.
	CompactionFailed bool
	// Broken: a write failed; the agent refuses new intents (503) until it
	// restarts.
	Broken bool
	// Syncs and Records count the batches synced and the records in them.
	Syncs, Records uint64
	// Quarantined counts the bad lines set aside when the journal was
	// opened (a copy of the file is kept beside it).
	Quarantined int
}

// JournalSyncBuckets span an fdatasync on tmpfs or a fast SSD (tens of
// microseconds) to a stalled disk.
var JournalSyncBuckets = []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}

// NewJournalSync registers and returns the histogram of the time one batch
// of records took to write and fdatasync: what each intent's
// acknowledgement waited for. The journal's writer observes it.
func NewJournalSync(reg prometheus.Registerer) prometheus.Histogram {
	h := prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: namespace,
		Name:      "journal_sync_duration_seconds",
		Help:      "Time to write and fdatasync one batch of journal records, which every intent in the batch waited for before it was acknowledged.",
		Buckets:   JournalSyncBuckets,
	})
	reg.MustRegister(h)
	return h
}

// RegisterJournal registers the journal's size, intents, compactions,
// batches and health, read from stats at each scrape.
func RegisterJournal(reg prometheus.Registerer, stats func() JournalStats) {
	reg.MustRegister(&journalCollector{stats: stats})
}

var (
	journalSize = prometheus.NewDesc(namespace+"_journal_size_bytes",
		"Size of the intent journal file.", nil, nil)
	journalIntents = prometheus.NewDesc(namespace+"_journal_intents",
		"Intents the journal holds (live ones, each container's last completed one and the history).", nil, nil)
	journalCompactions = prometheus.NewDesc(namespace+"_journal_compactions_total",
		"Successful compactions of the journal file.", nil, nil)
	journalCompactionFailed = prometheus.NewDesc(namespace+"_journal_compaction_failed",
		"1 if the last compaction of the journal failed (the file grows until one succeeds).", nil, nil)
	journalBroken = prometheus.NewDesc(namespace+"_journal_broken",
		"1 if a journal write failed: the agent refuses new intents (503 JournalUnavailable) and is not ready until restarted.", nil, nil)
	journalSyncs = prometheus.NewDesc(namespace+"_journal_syncs_total",
		"Batches of records written and synced to the journal.", nil, nil)
	journalRecords = prometheus.NewDesc(namespace+"_journal_records_total",
		"Records written to the journal; divided by syncs, how many shared one fdatasync.", nil, nil)
	journalQuarantined = prometheus.NewDesc(namespace+"_journal_quarantined_lines_total",
		"Bad lines (a checksum that does not hold) set aside when the journal was opened; the file as it was is kept beside it, and the records in those lines are lost.", nil, nil)
)

// journalCollector reads the figures at scrape time rather than keeping
// gauges the journal would have to update: the journal stays free of
// Prometheus, and a scrape sees the file as it is.
type journalCollector struct{ stats func() JournalStats }

func (c *journalCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{journalSize, journalIntents, journalCompactions, journalCompactionFailed, journalBroken, journalSyncs, journalRecords, journalQuarantined} {
		ch <- d
	}
}

func (c *journalCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.stats()
	b := func(v bool) float64 {
		if v {
			return 1
		}
		return 0
	}
	ch <- prometheus.MustNewConstMetric(journalSize, prometheus.GaugeValue, float64(s.SizeBytes))
	ch <- prometheus.MustNewConstMetric(journalIntents, prometheus.GaugeValue, float64(s.Intents))
	ch <- prometheus.MustNewConstMetric(journalCompactions, prometheus.CounterValue, float64(s.Compactions))
	ch <- prometheus.MustNewConstMetric(journalCompactionFailed, prometheus.GaugeValue, b(s.CompactionFailed))
	ch <- prometheus.MustNewConstMetric(journalBroken, prometheus.GaugeValue, b(s.Broken))
	ch <- prometheus.MustNewConstMetric(journalSyncs, prometheus.CounterValue, float64(s.Syncs))
	ch <- prometheus.MustNewConstMetric(journalRecords, prometheus.CounterValue, float64(s.Records))
	ch <- prometheus.MustNewConstMetric(journalQuarantined, prometheus.CounterValue, float64(s.Quarantined))
}
