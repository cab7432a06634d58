// Package journal is the agent's durable store of intents: an append-only
// file of JSON lines, each the whole intent as it was at one moment, so that
// intents accepted before a crash can be recovered when the agent starts
// again.
//
// Append queues a record behind every record appended before it; Wait
// returns once it is on disk (written and fdatasync'ed). Records appended
// while a write is in flight go out together in the next write, with one
// sync (group commit), so concurrent submitters share the cost of a sync.
// After a failed write or sync every later Append fails too: the order of
// the file is the order of the records, and nothing may follow a gap.
//
// Each line is a CRC-32C (hex) of the JSON, a space, and the JSON. On Open,
// a torn tail (a crash in the middle of a write: an unterminated or bad
// last line, or bad lines with no good one after them) is cut off; a bad
// line with good lines after it is corruption, and Open fails with
// ErrCorrupt rather than guess.
//
// When the file grows past a threshold it is compacted: rewritten, through
// a temporary file that is synced, renamed over it and followed by a sync of
// the directory, with only what recovery needs: every intent not yet in a
// terminal state, each container's last Completed intent (its resources)
// and the newest terminal intents up to the history size.
//
// An exclusive flock on the directory's lock file keeps two agents from
// sharing a state directory.
package journal
