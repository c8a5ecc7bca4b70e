from memmill.cli import main

main()
