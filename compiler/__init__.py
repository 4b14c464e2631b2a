"""harnessrl.compiler"""
