package cli

import (
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/workers"
)

// builtinSet holds the constructors of Better Compute's own modules; each
// module's file adds its own in an init function. Their migrations are in the
// built-in set (migrations/, in migrations.Owners order), so a built-in Module
// leaves Migrations nil.
var builtinSet []func() Module

// builtinModules are Better Compute's own modules, registered before the
// application's.
func builtinModules() []Module {
	out := make([]Module, 0, len(builtinSet))
	for _, f := range builtinSet {
		out = append(out, f())
	}
	return out
}

// Registry builds the worker registry from the built-in modules and the
// application's, in order. It returns INVALID_CONFIG for a module that registers
// something invalid.
func (s *Session) Registry() (*workers.Registry, error) {
	reg := workers.NewRegistry()
	mods := append(builtinModules(), s.App.Modules...)
	if s.extraModules != nil {
		mods = append(mods, s.extraModules...)
	}
	for _, m := range mods {
		if m.Register == nil {
			continue
		}
		if err := m.Register(reg); err != nil {
			if fault.CodeOf(err) == fault.Internal {
				err = fault.Wrap(fault.InvalidConfig, err, "module %s", m.Name)
			}
			return nil, err
		}
	}
	return reg, nil
}
