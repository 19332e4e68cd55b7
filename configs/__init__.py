"""Ready runs, shipped inside the package as `rlfleet.configs`: `rlfleet up --config
cartpole-dqn` finds `cartpole-dqn.yaml` here by name."""
