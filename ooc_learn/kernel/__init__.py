"""Kernel SVM: SMO, alpha-seeded k-fold CV and exact leave-one-out."""
