from hw.board.board import main

main()
