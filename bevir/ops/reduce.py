"""(ops to come)"""
