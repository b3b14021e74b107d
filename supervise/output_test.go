package supervise

import (
	"fmt"
	"strings"
	"testing"
)

func TestReadLines(t *testing.T) {
	input := "first\r\nloading 10%\rloading 100%\n\n" + strings.Repeat("a", 25) + "\nlast without end"
	var got []string
	readLines(strings.NewReader(input), 10, func(line string) { got = append(got, line) })
	want := []string{"first", "loading 10", "%", "loading 10", "0%",
		"aaaaaaaaaa", "aaaaaaaaaa", "aaaaa", "last witho", "ut end"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("got %q\nwant %q", got, want)
	}
}

func TestReadLinesKeepsShortLinesWhole(t *testing.T) {
	var got []string
	readLines(strings.NewReader("INFO model loaded\nWARNING slow\n"), 1<<10, func(line string) { got = append(got, line) })
	if fmt.Sprint(got) != fmt.Sprint([]string{"INFO model loaded", "WARNING slow"}) {
		t.Errorf("got %q", got)
	}
}
