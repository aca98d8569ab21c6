// Command showenv prints what a machine gave it: its arguments, uid,
// working directory and two variables. The image tests build it static,
// as the only program of their images.
package main

import (
	"fmt"
	"os"
	"strings"
)

func main() {
	wd, _ := os.Getwd()
	fmt.Printf("args=%s uid=%d cwd=%s PATH=%s FOO=%s\n", strings.Join(os.Args[1:], ","), os.Getuid(), wd, os.Getenv("PATH"), os.Getenv("FOO"))
}
