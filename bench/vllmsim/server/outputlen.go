package server

import (
	"fmt"
	"strconv"
	"strings"
)

// OutputLen is how many tokens a reply has, given the request's max_tokens: exactly max_tokens
// (the default), or drawn uniformly between two bounds and capped by max_tokens, the model
// then stopping by itself.
type OutputLen struct {
	uniform   bool
	low       int
	high      int  // used when !highIsMax
	highIsMax bool // the upper bound is the request's max_tokens
}

// ParseOutputLen reads "max" or "uniform:LOW:HIGH", where HIGH may be "max".
func ParseOutputLen(s string) (OutputLen, error) {
	if s == "" || s == "max" {
		return OutputLen{}, nil
	}
	parts := strings.Split(s, ":")
	if len(parts) != 3 || parts[0] != "uniform" {
		return OutputLen{}, fmt.Errorf("output length %q: want max or uniform:LOW:HIGH (HIGH may be max)", s)
	}
	low, err := strconv.Atoi(parts[1])
	if err != nil || low < 1 {
		return OutputLen{}, fmt.Errorf("output length %q: LOW must be a positive integer", s)
	}
	o := OutputLen{uniform: true, low: low, highIsMax: parts[2] == "max"}
	if !o.highIsMax {
		if o.high, err = strconv.Atoi(parts[2]); err != nil || o.high < low {
			return OutputLen{}, fmt.Errorf("output length %q: HIGH must be max or an integer >= LOW", s)
		}
	}
	return o, nil
}

// String returns the form ParseOutputLen reads.
func (o OutputLen) String() string {
	if !o.uniform {
		return "max"
	}
	high := "max"
	if !o.highIsMax {
		high = strconv.Itoa(o.high)
	}
	return fmt.Sprintf("uniform:%d:%s", o.low, high)
}

// Draw returns the reply length for a request with maxTokens, deterministic in seed.
func (o OutputLen) Draw(seed uint64, maxTokens int) int {
	if !o.uniform {
		return maxTokens
	}
	high := maxTokens
	if !o.highIsMax {
		high = min(o.high, maxTokens)
	}
	low := min(o.low, high)
	return low + int(mix64(seed)%uint64(high-low+1))
}

// mix64 is the SplitMix64 finalizer: a cheap, well-spread hash of x.
func mix64(x uint64) uint64 {
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}
