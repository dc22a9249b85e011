"""Remote agents: the Agent's tokens, the one service layer every remote surface calls, its
error table and the one JSON shape of a todo. No dependency beyond the core's."""
