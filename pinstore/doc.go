// Package pinstore shares the session → replica pin table of several Caddy
// instances through Redis (or a Redis-compatible server), so that a
// conversation stays on one vLLM replica whichever instance receives it.
//
// The local pin table stays the hot path: a request whose session is pinned
// locally never touches Redis. Redis is asked only on a local miss (Claim:
// the first instance to pin a session wins, the others adopt its choice) and
// on a move (Repin: a compare-and-set). Won claims and moves are published
// (Pub/Sub), so that the other instances follow a move at once and count a
// new conversation's load on its replica before its next turn reaches them. TTLs are refreshed in one pipelined batch per
// SyncInterval (Run), never per request; the same batch repairs pins a
// missed message or an emptied Redis left wrong.
//
// Redis is advisory: every call is bounded by Config.Timeout and a circuit
// breaker, and when the store cannot answer the caller keeps its local
// decision. A request never fails or waits long because of Redis.
//
// Keys hold hashed session keys only, never raw session IDs:
//
//	<prefix>:<model>:pin:<16 hex digits>  value: replica ID, PX = TTL
//	<prefix>:<model>:pins                 sorted set: hex key → last use (server ms)
//	<prefix>:<model>:alive                marker; missing = Redis lost its data
//	<prefix>:<model>:repin                Pub/Sub channel, "<hex key> <replica>"
//
// Every write trims the sorted set (idle past TTL, then oldest beyond
// MaxPins, deleting their pins), so a flood of distinct sessions keeps
// Redis memory bounded by MaxPins. The scripts build pin key names from the
// prefix, so they suit a standalone server or Sentinel, not Redis Cluster.
//
// Why go-redis v9 and not rueidis: AIBrix, the one LLM gateway that already
// arbitrates session pins in Redis, uses go-redis; caddy-storage-redis, the
// Redis module Caddy users run, uses it too, so its options and errors are
// familiar; and its API is plain. rueidis's strength, server-assisted
// client-side caching, is not needed: our cache is the local pin table.
package pinstore
