package main

import (
	"fmt"
	"io"
	"os"

	"github.com/schollz/progressbar/v3"

	"github.com/lmwarden/caddy-warden/bench/report"
)

// present prints the table and writes the JSON file and plots the flags ask for.
func present(c *common, rows []report.Row, stdout io.Writer) error {
	if err := report.PrintTable(stdout, rows); err != nil {
		return err
	}
	noteUntimedConversations(stdout, rows)
	if err := writeJSON(c, rows, stdout); err != nil {
		return err
	}
	if c.plotsDir != "" {
		paths, err := report.WritePlots(c.plotsDir, rows)
		if err != nil {
			return err
		}
		printPaths(stdout, "Plots", paths)
	}
	return nil
}

// noteUntimedConversations says how many conversations sent in the window
// the Conv columns leave out because the load stopped before they ended
// (the window's end in a run): those columns then favour short conversations.
func noteUntimedConversations(w io.Writer, rows []report.Row) {
	timed, cut := 0, 0
	for _, r := range rows {
		timed, cut = timed+r.ConversationsTimed, cut+r.ConversationsCut
	}
	if cut > 0 {
		fmt.Fprintf(w, "\nConv p50/p95 leave out %d of the %d conversations sent in the window, still under way when the load stopped: they favour short conversations.\n",
			cut, timed+cut)
	}
}

// writeJSON writes rows to --json, if given.
func writeJSON(c *common, rows []report.Row, stdout io.Writer) error {
	if c.jsonPath == "" {
		return nil
	}
	if err := report.WriteJSON(c.jsonPath, rows); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nJSON: %s\n", c.jsonPath)
	return nil
}

func printPaths(stdout io.Writer, what string, paths []string) {
	fmt.Fprintf(stdout, "\n%s:\n", what)
	for _, p := range paths {
		fmt.Fprintf(stdout, "  %s\n", p)
	}
}

// newProgress returns a progress bar over total steps on stderr, drawn only
// when stderr is a terminal so that logs stay clean.
func newProgress(stderr io.Writer, total int, what string) *progressbar.ProgressBar {
	return progressbar.NewOptions(total,
		progressbar.OptionSetWriter(stderr),
		progressbar.OptionSetDescription(what),
		progressbar.OptionShowCount(),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionClearOnFinish(),
		progressbar.OptionSetVisibility(isTerminal(stderr)),
	)
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	info, err := f.Stat()
	return err == nil && info.Mode()&os.ModeCharDevice != 0
}
