"""The GatewayService (#4 lands the implementation)."""
