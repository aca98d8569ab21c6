package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/api"
	"github.com/corral-sandbox/corral/egress"
	"github.com/corral-sandbox/corral/store"
)

// TestEgressAPI: owners and admins set a project's policy, members read it
// and its journal, nobody else sees either; a bad policy is 400 and leaves
// the stored one alone.
func TestEgressAPI(t *testing.T) {
	e := newEnv(t, envOpts{app: AppOptions{Admins: []string{"root"}}})
	ctx := context.Background()
	owner, otok := e.account("owner")
	member, mtok := e.account("member")
	_, stok := e.account("stranger")
	_, rtok := e.account("root")
	p := e.managedProject("p", owner)
	if _, err := e.st.AddMember(ctx, store.Member{Project: p.ID, Account: member.ID, Role: store.RoleMember}); err != nil {
		t.Fatal(err)
	}
	path := fmt.Sprintf("/v1/projects/%d/egress", p.ID)

	code, body := e.do(ctx, "GET", path, mtok, nil)
	if code != 200 || strings.TrimSpace(string(body)) != `{"mode":"none","allow":[],"deny":[]}` {
		t.Fatalf("GET default = %d %s", code, body)
	}
	set := api.EgressPolicy{Mode: "proxy", Allow: []string{"pypi.org", " *.pythonhosted.org"}, Deny: []string{"10.0.0.0/8"}}
	if code, body := e.do(ctx, "PUT", path, mtok, set); code != http.StatusForbidden {
		t.Errorf("PUT by a member = %d %s", code, body)
	}
	for _, tok := range []string{stok} {
		for _, pth := range []string{path, path + "/log"} {
			if code, body := e.do(ctx, "GET", pth, tok, nil); code != http.StatusForbidden {
				t.Errorf("GET %s by a stranger = %d %s", pth, code, body)
			}
		}
		if code, _ := e.do(ctx, "PUT", path, tok, set); code != http.StatusForbidden {
			t.Errorf("PUT by a stranger = %d", code)
		}
	}
	code, body = e.do(ctx, "PUT", path, otok, set)
	if code != 200 || !strings.Contains(string(body), `"allow":["pypi.org","*.pythonhosted.org"]`) {
		t.Fatalf("PUT by the owner = %d %s", code, body)
	}
	for _, bad := range []any{
		api.EgressPolicy{Mode: "open"}, api.EgressPolicy{Mode: "proxy", Allow: []string{"a b"}},
		api.EgressPolicy{Mode: "none", Allow: []string{"pypi.org"}}, `{"mode":"proxy","allow":"pypi.org"}`,
	} {
		if code, body := e.do(ctx, "PUT", path, otok, bad); code != http.StatusBadRequest {
			t.Errorf("PUT %v = %d %s", bad, code, body)
		}
	}
	if code, _ := e.do(ctx, "PUT", path, rtok, api.EgressPolicy{Mode: "proxy", Allow: []string{"pypi.org"}}); code != 200 {
		t.Errorf("PUT by an admin (not a member) = %d", code)
	}
	if pol, err := egress.LoadPolicy(ctx, e.st, p.ID); err != nil || len(pol.Allow) != 1 || pol.Allow[0] != "pypi.org" {
		t.Errorf("stored %+v, %v", pol, err)
	}

	if _, err := e.st.AppendEgress(ctx, store.EgressEntry{Account: owner.ID, Project: p.ID, Protocol: "connect", Name: "pypi.org",
		Addr: "151.101.0.223", Port: 443, Verdict: "allowed", Rule: "pypi.org", BytesIn: 100, BytesOut: 10,
		StartedAt: time.Now(), Duration: time.Second}); err != nil {
		t.Fatal(err)
	}
	code, body = e.do(ctx, "GET", path+"/log?limit=5", mtok, nil)
	var rows []api.EgressLogEntry
	if code != 200 || json.Unmarshal(body, &rows) != nil || len(rows) != 1 || rows[0].Verdict != "allowed" ||
		rows[0].BytesIn != 100 || rows[0].DurationMS != 1000 {
		t.Errorf("GET log = %d %s", code, body)
	}
	if code, _ := e.do(ctx, "GET", path+"/log?limit=0", mtok, nil); code != http.StatusBadRequest {
		t.Errorf("limit 0 = %d", code)
	}
}

func TestEgressMetrics(t *testing.T) {
	m := NewMetrics()
	m.ObserveEgress(egress.Record{Verdict: egress.VerdictAllowed, BytesIn: 1000, BytesOut: 10})
	m.ObserveEgress(egress.Record{Verdict: egress.VerdictDenied})
	m.ObserveEgress(egress.Record{Verdict: egress.VerdictDenied})
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	for _, want := range []string{
		`corral_egress_connections_total{verdict="allowed"} 1`, `corral_egress_connections_total{verdict="denied"} 2`,
		`corral_egress_bytes_total{direction="in"} 1000`, `corral_egress_bytes_total{direction="out"} 10`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}
