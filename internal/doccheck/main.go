// Command doccheck keeps the user docs usable: the README under a number of
// lines, and every relative link of the Markdown files it is given (a file,
// or every .md file under a directory) pointing to a file that exists and,
// for a link with a #fragment into Markdown, to one of its headings.
//
//	go run ./internal/doccheck -max-readme-lines 300 README.md CHANGELOG.md docs
package main

import (
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"unicode"
)

func main() {
	maxLines := flag.Int("max-readme-lines", 300, "most lines README.md may have")
	flag.Parse()
	problems, err := check(flag.Args(), *maxLines)
	if err != nil {
		fmt.Fprintln(os.Stderr, "doccheck:", err)
		os.Exit(2)
	}
	for _, p := range problems {
		fmt.Fprintln(os.Stderr, p)
	}
	if len(problems) > 0 {
		os.Exit(1)
	}
}

// check returns what is wrong with the Markdown files under paths.
func check(paths []string, maxReadmeLines int) ([]string, error) {
	var files []string
	for _, p := range paths {
		err := filepath.WalkDir(p, func(path string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() && strings.HasSuffix(path, ".md") {
				files = append(files, path)
			}
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	var problems []string
	anchors := map[string]map[string]bool{} // by file, its headings' fragments
	for _, f := range files {
		text, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		if filepath.Base(f) == "README.md" && filepath.Dir(f) == "." {
			if n := strings.Count(string(text), "\n"); n > maxReadmeLines {
				problems = append(problems, fmt.Sprintf("%s: %d lines, more than %d", f, n, maxReadmeLines))
			}
		}
		for _, l := range links(string(text)) {
			target, fragment, _ := strings.Cut(l.target, "#")
			path := f
			if target != "" {
				path = filepath.Join(filepath.Dir(f), target)
			}
			if _, err := os.Stat(path); err != nil {
				problems = append(problems, fmt.Sprintf("%s:%d: link to %s: no such file", f, l.line, l.target))
				continue
			}
			if fragment == "" || !strings.HasSuffix(path, ".md") {
				continue
			}
			if anchors[path] == nil {
				data, err := os.ReadFile(path)
				if err != nil {
					return nil, err
				}
				anchors[path] = headingFragments(string(data))
			}
			if !anchors[path][fragment] {
				problems = append(problems, fmt.Sprintf("%s:%d: link to %s: no such heading", f, l.line, l.target))
			}
		}
	}
	return problems, nil
}

type link struct {
	target string
	line   int
}

var linkPattern = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// links are the relative link targets of a Markdown text, outside code.
func links(text string) []link {
	var out []link
	for i, line := range proseLines(text) {
		if line == "" {
			continue
		}
		line = inlineCode.ReplaceAllString(line, "")
		for _, m := range linkPattern.FindAllStringSubmatch(line, -1) {
			if t := m[1]; !strings.Contains(t, "://") && !strings.HasPrefix(t, "mailto:") {
				out = append(out, link{target: t, line: i + 1})
			}
		}
	}
	return out
}

var inlineCode = regexp.MustCompile("`[^`]*`")

// proseLines are the text's lines with those inside fenced code blocks
// blanked, so that indexes stay line numbers.
func proseLines(text string) []string {
	lines := strings.Split(text, "\n")
	fenced := false
	for i, line := range lines {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			lines[i] = ""
			continue
		}
		if fenced {
			lines[i] = ""
		}
	}
	return lines
}

var heading = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)

// headingFragments are the fragments GitHub gives the text's headings: the
// rendered text lower-cased, punctuation dropped, spaces as hyphens, and a
// repeated one numbered.
func headingFragments(text string) map[string]bool {
	out := map[string]bool{}
	for _, line := range proseLines(text) {
		m := heading.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		slug := slugify(rendered(m[1]))
		for n, s := 1, slug; ; n++ {
			if !out[s] {
				out[s] = true
				break
			}
			s = fmt.Sprintf("%s-%d", slug, n)
		}
	}
	return out
}

var markdownLink = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)

// rendered drops a heading's Markdown: links keep their text, code and
// emphasis their content.
func rendered(s string) string {
	s = markdownLink.ReplaceAllString(s, "$1")
	return strings.NewReplacer("`", "", "*", "").Replace(s)
}

func slugify(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		switch {
		case unicode.IsLetter(r), unicode.IsDigit(r), r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}
