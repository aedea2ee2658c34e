from llmledger.cli import entry

entry()
