package cli

import (
	"github.com/bettercompute/bettercompute/platform/fault"
	"github.com/bettercompute/bettercompute/workers"
)

// builtinModules are Better Compute's own modules, registered before the
// application's. Their migrations are in the built-in set (migrations/).
func builtinModules() []Module {
	return nil
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
