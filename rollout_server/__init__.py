"""The RolloutService (#6 lands the implementation)."""
