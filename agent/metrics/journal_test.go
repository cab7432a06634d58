package metrics_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/resizer/resize-agent/agent/metrics"
)

func TestJournalCollector(t *testing.T) {
	st := metrics.JournalStats{SizeBytes: 4096, Intents: 12, Compactions: 3, Syncs: 40, Records: 90, Quarantined: 1}
	reg := prometheus.NewPedanticRegistry()
	metrics.RegisterJournal(reg, func() metrics.JournalStats { return st })
	want := `
# HELP resize_agent_journal_broken 1 if a journal write failed: the agent refuses new intents (503 JournalUnavailable) and is not ready until restarted.
# TYPE resize_agent_journal_broken gauge
resize_agent_journal_broken 0
# HELP resize_agent_journal_compaction_failed 1 if the last compaction of the journal failed (the file grows until one succeeds).
# TYPE resize_agent_journal_compaction_failed gauge
resize_agent_journal_compaction_failed 0
# HELP resize_agent_journal_compactions_total Successful compactions of the journal file.
# TYPE resize_agent_journal_compactions_total counter
resize_agent_journal_compactions_total 3
# HELP resize_agent_journal_intents Intents the journal holds (live ones, each container's last completed one and the history).
# TYPE resize_agent_journal_intents gauge
resize_agent_journal_intents 12
# HELP resize_agent_journal_quarantined_lines_total Bad lines (a checksum that does not hold) set aside when the journal was opened; the file as it was is kept beside it, and the records in those lines are lost.
# TYPE resize_agent_journal_quarantined_lines_total counter
resize_agent_journal_quarantined_lines_total 1
# HELP resize_agent_journal_records_total Records written to the journal; divided by syncs, how many shared one fdatasync.
# TYPE resize_agent_journal_records_total counter
resize_agent_journal_records_total 90
# HELP resize_agent_journal_size_bytes Size of the intent journal file.
# TYPE resize_agent_journal_size_bytes gauge
resize_agent_journal_size_bytes 4096
# HELP resize_agent_journal_syncs_total Batches of records written and synced to the journal.
# TYPE resize_agent_journal_syncs_total counter
resize_agent_journal_syncs_total 40
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	// Read at each scrape: a journal that broke since shows at once.
	st.Broken, st.CompactionFailed = true, true
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP resize_agent_journal_broken 1 if a journal write failed: the agent refuses new intents (503 JournalUnavailable) and is not ready until restarted.
# TYPE resize_agent_journal_broken gauge
resize_agent_journal_broken 1
# HELP resize_agent_journal_compaction_failed 1 if the last compaction of the journal failed (the file grows until one succeeds).
# TYPE resize_agent_journal_compaction_failed gauge
resize_agent_journal_compaction_failed 1
`), "resize_agent_journal_broken", "resize_agent_journal_compaction_failed"); err != nil {
		t.Fatal(err)
	}
}

func TestJournalSync(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	h := metrics.NewJournalSync(reg)
	h.Observe(0.0003)
	h.Observe(0.02)
	if n := testutil.CollectAndCount(h); n != 1 {
		t.Fatalf("%d metrics", n)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != 1 || mfs[0].GetName() != "resize_agent_journal_sync_duration_seconds" || mfs[0].GetMetric()[0].GetHistogram().GetSampleCount() != 2 {
		t.Fatalf("gathered %v", mfs)
	}
}
