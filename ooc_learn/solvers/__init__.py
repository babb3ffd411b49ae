"""Linear solvers: dual coordinate descent, TRON, IBCD, block minimisation, PEGASOS."""
