"""A Python model of what the cache must return (the test oracle)."""

import numpy as np


def slots(table, row, start, count, bs):
    pos = np.arange(start, start + count)
    return table[row, pos // bs].astype(np.int64) * bs + pos % bs


def row_bytes(key_seed, req, pos, rb):
    """A deterministic row for (key, request, position)."""
    x = (np.uint64(key_seed) * np.uint64(1000003) + np.uint64(req) * np.uint64(7919) + np.uint64(pos)) * np.uint64(2654435761)
    return np.frombuffer(np.full(rb // 8 + 1, x, dtype=np.uint64).tobytes()[:rb], dtype=np.uint8)


class Mirror:
    """Committed rows by (key, slot); absent optional rows read as zeros."""

    def __init__(self, keys):
        self.keys = keys
        self.rows = {k.name: {} for k in keys}

    def write(self, key, slot_list, data):
        for s, r in zip(slot_list, data):
            self.rows[key][int(s)] = bytes(r)

    def omit(self, key, slot_list):
        for s in slot_list:
            self.rows[key].pop(int(s), None)

    def read(self, key, slot_list, rb):
        out = np.zeros((len(slot_list), rb), np.uint8)
        for i, s in enumerate(slot_list):
            r = self.rows[key].get(int(s))
            if r is not None:
                out[i] = np.frombuffer(r, np.uint8)
        return out


class Delivery:
    """What materialize delivered to each request, in order, and the
    position its delivery is at (omnicache.Result.From): a request's rows
    continue where its last delivery stopped, with no gap and no repeat,
    except after a replace (restart)."""

    def __init__(self, rb):
        self.rb = rb
        self.got = {}  # request -> delivered rows, concatenated
        self.at = {}  # request -> the position delivery is at

    def take(self, res, key):
        for i, rid in enumerate(res.ids):
            rid, n = int(rid), int(res.tokens[i])
            if n == 0:
                continue
            assert int(res.from_[i]) == self.at.get(rid, 0), \
                "request %d delivered from %d, delivery is at %d" % (rid, res.from_[i], self.at.get(rid, 0))
            self.got[rid] = np.concatenate([self.got.get(rid, np.zeros((0, self.rb), np.uint8)), res.rows(i, key)])
            self.at[rid] = self.at.get(rid, 0) + n

    def restart(self, rid, pos):
        """rid's tokens from pos on were replaced: delivery restarts there."""
        self.got[rid] = self.got[rid][:pos]
        self.at[rid] = pos
