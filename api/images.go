package api

import "time"

// ImagePullRequest is the body of POST /v1/images (administrators).
type ImagePullRequest struct {
	// Ref is the registry reference (debian:bookworm, REPO@sha256:...).
	Ref string `json:"ref"`
	// Name is the image's name in the store; empty means the last part of
	// Ref's repository.
	Name string `json:"name,omitempty"`
}

// Image is a machine image as the API shows it (GET and POST /v1/images):
// without its host paths.
type Image struct {
	Name string `json:"name"`
	// ID is the config digest ("sha256:...").
	ID string `json:"id"`
	// Digest is the manifest digest a registry serves it by (pulled
	// images; empty otherwise).
	Digest string `json:"digest,omitempty"`
	// Source is the reference, archive or directory it came from.
	Source  string    `json:"source,omitempty"`
	Created time.Time `json:"created"`
	// Size is the bytes of file content of its layers.
	Size   int64       `json:"size"`
	Layers int         `json:"layers"`
	Config ImageConfig `json:"config"`
}

// ImageConfig is what machines apply of an image's configuration: User
// (the default user), Env (under a request's env), WorkingDir (the default
// cwd), Entrypoint and Cmd (a command-less corral run).
type ImageConfig struct {
	User       string   `json:"user,omitempty"`
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
}
