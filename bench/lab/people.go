package lab

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/lmwarden/caddy-warden/bench/agentload"
	"github.com/lmwarden/caddy-warden/bench/report"
)

// Person is one of the people who share a fleet (Config.People): Sessions
// conversations of the workload at a time, with ThinkTime between turns,
// each of its turns in the person's own flow, as a proxy tells people apart
// by their API keys, served Weight turns a round (0 is 1).
type Person struct {
	Name      string
	Sessions  int
	ThinkTime time.Duration
	Weight    float64
}

// TwoPeople is a team's farm: one person runs 20 agents in parallel that
// never pause, another works at a terminal in 2 conversations, 30 s between
// turns on average.
var TwoPeople = []Person{{"farm", 20, 0, 0}, {"person", 2, 30 * time.Second, 0}}

// ParsePeople reads people from "two" (TwoPeople) or a comma-separated list
// of name:sessions:think-time[:weight], such as "farm:20:0s,person:2:30s:2".
func ParsePeople(spec string) ([]Person, error) {
	if spec == "two" {
		return TwoPeople, nil
	}
	var people []Person
	for _, part := range strings.Split(spec, ",") {
		fields := strings.Split(strings.TrimSpace(part), ":")
		if len(fields) != 3 && len(fields) != 4 {
			return nil, fmt.Errorf("person %q: want name:sessions:think-time[:weight]", part)
		}
		n, err := strconv.Atoi(fields[1])
		if err != nil || n < 1 {
			return nil, fmt.Errorf("person %q: sessions must be a positive integer", part)
		}
		think, err := time.ParseDuration(fields[2])
		if err != nil || think < 0 {
			return nil, fmt.Errorf("person %q: think time must be a duration, 0s or more", part)
		}
		var weight float64
		if len(fields) == 4 {
			if weight, err = strconv.ParseFloat(fields[3], 64); err != nil || !(weight > 0) || math.IsInf(weight, 0) {
				return nil, fmt.Errorf("person %q: weight must be a positive number", part)
			}
		}
		people = append(people, Person{fields[0], n, think, weight})
	}
	return people, checkPeople(people)
}

func checkPeople(people []Person) error {
	seen := map[string]bool{}
	for _, p := range people {
		if p.Name == "" || seen[p.Name] {
			return fmt.Errorf("people need distinct names, got %q twice or empty", p.Name)
		}
		if p.Sessions < 1 || p.ThinkTime < 0 {
			return fmt.Errorf("person %s: sessions must be at least 1 and think time not negative", p.Name)
		}
		seen[p.Name] = true
	}
	return nil
}

// Sessions is how many conversations the people hold at a time in all.
func Sessions(people []Person) int {
	n := 0
	for _, p := range people {
		n += p.Sessions
	}
	return n
}

// Workload is p's workload in a run seeded with seed: the same whoever
// shares the fleet, so that a person's runs alone and beside others compare.
func (p Person) Workload(wl agentload.Config, seed int64) agentload.Config {
	wl.ThinkTime = p.ThinkTime
	wl.Seed = agentload.LevelSeed(seed, p.Sessions) ^ int64(xxhash.Sum64String(p.Name)>>1)
	return wl
}

// Row is p's row of a run: the fleet's figures (hits, busy replicas,
// preemptions) from fleet, the client's from p's own summary, whose clock
// runs timeScale times slower than the reported one (report.Row.SetClientSide).
func (p Person) Row(fleet report.Row, sum agentload.Summary, timeScale float64) report.Row {
	row := fleet
	row.Person, row.Sessions, row.ThinkTimeS = p.Name, p.Sessions, p.ThinkTime.Seconds()
	row.SetClientSide(sum, timeScale)
	return row
}

// checkPlan reports a plan whose levels are not the people's sessions.
func checkPlan(people []Person, plan Plan) error {
	if len(people) == 0 {
		return nil
	}
	if len(plan.Levels) != 1 || plan.Levels[0] != Sessions(people) {
		return errors.New("lab: with people, the one level is their sessions in all")
	}
	return checkPeople(people)
}
