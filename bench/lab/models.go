package lab

import "github.com/lmwarden/caddy-warden/loadcontrol"

// newModelsPolicy builds the named policy over env's engines, and returns
// it with the policy of each model (Config.models): itself, or with a
// small model one instance of the policy over each model's engines, as a
// Caddy site routes each model's requests by warden_model to its own
// reverse_proxy, with its own lb_policy warden.
func newModelsPolicy(env *Env, name string) (Policy, []Policy, error) {
	factory := policyFactories[name]
	cfg := env.Config()
	if cfg.SmallReplicas == 0 {
		p, err := factory(env)
		return p, []Policy{p}, err
	}
	seed := env.rng.Uint64()
	main, err := factory(env.part(0, cfg.Replicas, seed))
	if err != nil {
		return nil, nil, err
	}
	small, err := factory(env.part(cfg.Replicas, cfg.SmallReplicas, seed^0x5eed))
	if err != nil {
		return nil, nil, err
	}
	models := &twoModels{main: main, small: small, first: cfg.Replicas}
	if h, ok := main.(Holder); ok {
		return &twoModelsHolding{models, h}, []Policy{main, small}, nil
	}
	return models, []Policy{main, small}, nil
}

// twoModels routes the main turns with main over the first engines, and
// the side calls with small over the engines from first on.
type twoModels struct {
	main, small Policy
	first       int
}

func (p *twoModels) Pick(a Arrival) (int, func()) {
	if !a.Side {
		return p.main.Pick(a)
	}
	eng, release := p.small.Pick(a)
	if eng < 0 {
		return eng, release
	}
	return p.first + eng, release
}

// twoModelsHolding is twoModels whose main policy holds turns (load
// control). The sim sends side calls with Pick: the agent names them
// auxiliary, and load control lets those through.
type twoModelsHolding struct {
	*twoModels
	holder Holder
}

func (p *twoModelsHolding) Hold(a Arrival, dispatch func(engine int, release func(loadcontrol.Reply))) func() bool {
	return p.holder.Hold(a, dispatch)
}
