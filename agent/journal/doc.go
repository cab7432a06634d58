// Package journal is the agent's durable store of intents: an append-only
// file of JSON lines, each the whole intent as it was at one moment, so that
// intents accepted before a crash can be recovered when the agent starts
// again.
//
// Append queues a record behind every record appended before it; Wait
// returns once it is on disk (written and fdatasync'ed). Records appended
// while a write is in flight go out together in the next write, with one
// sync (group commit), so concurrent submitters share the cost of a sync.
// A batch whose write or sync fails is truncated off the file (and that
// synced) before its submitters hear of the failure, so a refused intent
// is never replayed; while the truncation fails too (EIO), the batch may
// be on disk and its submitters wait, the writer retrying the cut. After a
// failure every later Append fails too, until the journal is opened
// again: the order of the file is the order of the records, and nothing
// may follow a gap.
//
// The first line is a header with the format Version; each line after it
// is a CRC-32C (hex) of the JSON, a space, and the JSON. A file without a
// header is version 1; a newer version is refused (ErrVersion). On Open, a
// torn tail (a crash in the middle of a write: an unterminated or bad last
// line, or bad lines with no good one after them) is cut off. A bad line
// with good lines after it (a flipped bit) is set aside: the file as it
// was is copied beside it, the line is counted (Stats.Quarantined) and
// described (Quarantine), and the journal starts with every other line;
// the intent whose record it was goes back to its previous record, or is
// lost if it had none.
//
// Open streams the file twice, holding an index of each intent's last line
// (its offset, not the line) and then decoding only the records recovery
// needs: memory follows what is kept, not the size of the file.
//
// When the file grows past a threshold it is compacted: rewritten, through
// a temporary file that is synced, renamed over it and followed by a sync of
// the directory, with only what recovery needs: every intent not yet in a
// terminal state, each container's last Completed intent (its resources),
// the newest terminal intents up to the history size, and the Forget
// markers that cancel a Completed intent kept. The file stays below twice
// the compacted size (or the threshold) plus one batch.
//
// An exclusive flock on the directory's lock file keeps two agents from
// sharing a state directory.
//
// Why not go.etcd.io/bbolt (issue 15 weighed it): its data pages carry no
// checksum, so a flipped bit is read as data or panics the reader, the
// crash loop this package now avoids; a commit costs two fdatasyncs
// against one (etcd-io/bbolt tx.go: Commit syncs after tx.write, the
// pages, and again after tx.writeMeta); the agent's ordered, non-waiting Append
// would still need this writer in front of it; and old files would need a
// migration. The defects found were in the failure, compaction and replay
// paths of this file, each fixable in place with the format kept.
package journal
